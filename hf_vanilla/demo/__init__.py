"""The embedded demo (English → German spelled-out numbers, end to end) and the web app."""
