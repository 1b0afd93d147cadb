"""The device core: what one resource's devices are, how healthy, since when and why, and who holds
them. Mode-neutral: it knows no wire format (neither the Device Plugin API's nor DRA's); the
front-ends (`deviceplugin`, `dra`, with their writers) and the DeviceReport's writer (`report`)
subscribe to its snapshots."""
