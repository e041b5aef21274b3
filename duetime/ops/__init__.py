"""Operator tools: listings, inspection, repair actions, doctor, the key guide, schedule
lint and the renderers the CLI and the console share. Imported by the facade, the CLI and the
console; never by a worker or scheduler process."""
