"""Control plane: the meta role (epochs, barriers, commits, recovery) behind a FastAPI app."""
