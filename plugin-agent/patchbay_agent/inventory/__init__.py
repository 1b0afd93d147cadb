"""The node inventory: what hardware this node has, kept by the shared node agent in its node's
NodeInventory (docs/architecture.md#the-node-inventory).

`sysfs` reads it (PCI, USB, character devices by class, NVML GPUs) under the host root;
`document` turns a scan and what the node's profiles serve into the bounded object; `keeper`
writes it when it changes (inotify on /dev, a slow rescan of /sys), through the change-writer loop.
"""
