"""tokenferry worker: pulls generation jobs from Redis, runs the model, streams tokens back."""
