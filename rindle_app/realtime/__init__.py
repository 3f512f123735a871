"""The websocket transport: the rindle wire protocol over Channels."""
