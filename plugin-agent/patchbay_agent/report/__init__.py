"""The writers to the API server: the DeviceReport and the ResourceSlices, each kept true by the
one change-writer loop (`writer.py`)."""
