"""The MCP server's tools as the SDK publishes them, held to their schemas (mcp_server.py builds
them): each tool refuses what its input schema does not allow, in the schema's words, and the
server advertises only what it serves.

- An argument a tool does not take is refused, naming the ones it takes (the schema says
  `additionalProperties: false`); the SDK's own models ignore it.
- A value is taken only in its schema's type (pydantic's strict mode): true or false for a
  boolean (not "yes", "true" or 1), a whole number for an integer (not "5"; 3.0 is JSON
  Schema's integer 3), a number for a number (not true); a name of an enum's (send's `kind`) as
  the enum says it. A list given as a JSON array in a string is still a list (some clients send
  them so), but text is text: the SDK would parse any argument not typed plain `str` as JSON
  first, and refuse a subject `{"plan": 1}` or a thread `[7]` as not text.
- A whole number is at most MAX_INTEGER (10,000; the schema's `maximum`): a tool whose own
  bound is lower takes more as its most, as it says, but 1e30 is a mistake, refused.
- Resources and prompts are not advertised in the server's capabilities while it has none (the
  SDK advertises them whatever its lists hold); a client asking for them gets "method not found".
"""
import inspect
import json
from typing import Annotated

from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from pydantic import ConfigDict, Field, create_model

MAX_INTEGER = 10_000        # the largest whole number any tool takes

# The requests that serve resources and prompts, and so advertise them (the SDK's lowlevel Server
# derives its capabilities from the handlers it has).
RESOURCE_METHODS = ("resources/list", "resources/read", "resources/templates/list", "resources/subscribe",
                    "resources/unsubscribe")
PROMPT_METHODS = ("prompts/list", "prompts/get")


class Metadata(FuncMetadata):
    """The SDK's FuncMetadata, reading its arguments as their schema has them (pre_parse_json)."""
    lists: tuple = ()       # the arguments whose schema takes an array
    integers: tuple = ()    # the arguments whose schema takes an integer

    def pre_parse_json(self, data):
        """`data` with a JSON array in a string parsed for an argument that takes a list, and a
        whole float given for an integer made that integer; any other value as it came."""
        out = dict(data)
        for key, value in data.items():
            if key in self.lists and isinstance(value, str) and value.lstrip().startswith("["):
                try:
                    parsed = json.loads(value)
                except (ValueError, RecursionError):
                    continue        # relay's own words() says what is wrong with it
                if isinstance(parsed, list):
                    out[key] = parsed
            elif key in self.integers and type(value) is float and value.is_integer():
                out[key] = int(value)
        return out


def _types(schema):
    """The JSON types a property's schema allows."""
    return {schema.get("type"), *(s.get("type") for s in schema.get("anyOf", ()))} - {None}


def strict(fn):
    """The SDK's Tool for `fn` (a method: its name, its dedented docstring, its parameters), its
    arguments' model strict and closed to arguments it does not name, its input schema so."""
    tool = Tool.from_function(fn, description=inspect.cleandoc(fn.__doc__))
    loose = tool.fn_metadata.arg_model

    class Closed(loose):
        model_config = ConfigDict(extra="forbid", strict=True, title=loose.__name__)

    fields = Closed.model_fields
    whole = [k for k, f in fields.items() if "integer" in _types(Closed.model_json_schema()["properties"][k])]
    Arguments = create_model(loose.__name__, __base__=Closed, **{
        k: (Annotated[fields[k].annotation, Field(le=MAX_INTEGER)], fields[k]) for k in whole})
    tool.parameters = Arguments.model_json_schema(by_alias=True)
    properties = tool.parameters.get("properties", {})
    old = tool.fn_metadata
    tool.fn_metadata = Metadata(arg_model=Arguments, output_schema=old.output_schema, output_model=old.output_model,
                                wrap_output=old.wrap_output,
                                lists=tuple(k for k, v in properties.items() if "array" in _types(v)),
                                integers=tuple(k for k, v in properties.items() if "integer" in _types(v)))
    return tool


def takes(tool):
    """The names of the arguments a Tool takes, in its signature's order."""
    return list(tool.parameters.get("properties", {}))


def unadvertised(server):
    """Drop from `server` (an MCPServer, its resources and prompts registered) the handlers of
    resources when it has none, and of prompts when it has none: its capabilities then do not
    advertise them. (SDK 2.x offers no public way to remove a handler or to ask its lists
    without a request.)"""
    handlers = server._lowlevel_server._request_handlers
    resources = server._resource_manager.list_resources() or server._resource_manager.list_templates()
    for methods, served in ((RESOURCE_METHODS, resources), (PROMPT_METHODS, server._prompt_manager.list_prompts())):
        if not served:
            for method in methods:
                handlers.pop(method, None)
