"""
The synced models of the schema-change tests. Their migrations, not these classes,
decide the tables' columns: a server keeps running this code while another
process migrates, as in a deploy.
"""

from django.db import models


class Note(models.Model):
    id = models.CharField(max_length=20, primary_key=True)
    title = models.CharField(max_length=100)

    def __str__(self):
        return self.id


class Memo(models.Model):
    id = models.CharField(max_length=20, primary_key=True)
    title = models.CharField(max_length=100)

    def __str__(self):
        return self.id
