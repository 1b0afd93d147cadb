"""The DeviceReport: its document (`devicereport.py`, pure) and its writer (`reporter.py`, on the
one change-writer loop, `changewriter.py`)."""
