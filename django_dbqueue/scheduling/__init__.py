"""The scheduling room: recurring jobs, paused queues, retention."""
