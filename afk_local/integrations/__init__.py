"""Optional extras, each importing the library it adapts: nothing in the core imports them.

``langgraph`` (``pip install 'afk_local[langgraph]'``): a LangGraph checkpointer;
``openai`` (``afk_local[openai]``): an OpenAI-compatible chat client for the agent runner;
``pydantic_ai`` (``afk_local[pydantic-ai]``): ``DurableAgent``, durable pydantic-ai agent runs.
"""
