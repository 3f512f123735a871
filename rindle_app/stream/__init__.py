"""The outbox as a stream: reading committed changes in order."""
