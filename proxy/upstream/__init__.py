"""The proxy's HTTP/1.1 client for its calls to the workers, and its errors."""
