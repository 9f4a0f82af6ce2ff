"""The hot path: send, receive, peek and purge on one queue table, on the caller's connection."""
