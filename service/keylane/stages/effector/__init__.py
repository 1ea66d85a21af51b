"""The effector: executes side-effect intents once in effect and publishes their results."""
