"""The producer side of App: enqueueing runs, storing schedules, setting limits."""
