"""What differs between one device, DataParallel and DDP, and how processes are started."""
