"""Names, constants and the schemas of what users, files and the API server exchange with us.
No I/O."""
