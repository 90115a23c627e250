"""The lab: quota, gate, lease and checkpoint scenarios, measured on a real database.

Every value it prints is read back from the database, the checkpoint directory
or a child process (docs/streaming.md). The entry point is
:func:`quotagate.streaming.lab.runner.run_lab`; this package imports nothing
itself, so its child-process modules start without loading the others.
"""
