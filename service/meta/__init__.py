"""The meta role: epochs, barriers, collection and commit, scheduling, recovery."""
