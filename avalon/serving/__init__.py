"""The OpenAI-compatible server over the slot engine (`python -m avalon.serve`).

- `chat.py`: messages and tools to prompt ids through the model's chat template, completions
  back to content and tool calls, sampled ids remembered (no re-tokenisation);
- `protocol.py`: the chat-completions request validated, refusals as the API's error objects;
- `scheduler.py`: the thread that owns the engine; requests share its dispatches, cached slots
  give conversations their KV back;
- `server.py`: the routes on the hardened transport (`avalon/envs/transport.py`).
"""
