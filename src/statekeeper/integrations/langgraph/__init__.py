"""LangGraph on statekeeper: a checkpointer and a long-term store (extra ``langgraph``)."""
