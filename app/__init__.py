"""The application floor: the CLI and the pipeline (`tinyt.app`). Nothing below imports it;
`tinyt/__main__.py` is the door."""
