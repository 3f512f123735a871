"""rindle: a Django database as a real-time sync engine speaking the rindle protocol."""

__version__ = "0.1.0"
