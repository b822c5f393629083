"""The NameServer (``mqnamesrv``): broker registration and topic routes, in memory."""
