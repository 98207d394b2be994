"""Adapters that let existing agent frameworks keep their state in statekeeper.

Each adapter lives in its own module and needs its framework's extra:
``statekeeper[langgraph]``, ``statekeeper[openai-agents]``, ``statekeeper[adk]``.
Importing this package imports no framework.
"""
