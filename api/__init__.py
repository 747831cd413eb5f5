"""Names, constants and the schemas of what users and files hand us. No I/O."""
