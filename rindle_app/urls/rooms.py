"""
The room write authority: a room's placement epoch, its ledger and a host's cold boot.
A room's flushes go through the ingest plane's ``/apply-row-change-txn``: include both
(check ``rindle.E041``; without it ``/room-boot`` answers 501 ``plane_not_mounted``).
"""

from django.urls import path

from ..api import ingest_views as ingest
from ..api import room_views

urlpatterns = [
    path("claim-room-epoch", ingest.ClaimRoomEpochView.as_view(), name="rindle-claim-room-epoch"),
    path("room-lmids", ingest.RoomLmidsView.as_view(), name="rindle-room-lmids"),
    path("api/rindle/room-boot", room_views.RoomBootView.as_view(), name="rindle-room-boot"),
]
