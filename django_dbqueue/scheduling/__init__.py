"""The scheduling room: recurring schedules and their ticks."""
