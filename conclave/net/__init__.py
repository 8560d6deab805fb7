"""Network plumbing: the one HTTP transport seam, and the Host/Origin guard of the local web servers."""
