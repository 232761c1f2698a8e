"""The fleet planner: engine profiles, a fleet model, and `pdspec plan`."""
