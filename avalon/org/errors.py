"""`ToolError`: the one exception a tool raises for an invalid or failed call.

Its own module so that the workspace (which raises it for bad paths) and the environment
protocol (`env.py`, which names the workspace in its contexts and re-exports the error as part
of the protocol) do not import each other.
"""


class ToolError(Exception):
    """An invalid or failed tool call: the message goes back to the agent as a tool error."""
