"""Text made to fit: cutting strings and JSON arguments to a size, keeping a
tool output's error lines, and reading the files a shell command names.
Pure functions on strings; nothing here knows a message."""
