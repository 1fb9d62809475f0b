"""Small command-line tools over the packages (`python -m avalon.tools.<name>`)."""
