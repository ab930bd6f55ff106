"""MCP servers that misbehave in ways the SDK cannot be made to (stdlib only, so they start
fast): `malformed` answers initialize with a line that is not JSON-RPC, `silent` never answers.
Run as `python mcp_raw_server.py MODE`."""

import sys

if __name__ == "__main__":
    mode = sys.argv[1]
    for _line in sys.stdin:
        if mode == "malformed":
            sys.stdout.write('{"jsonrpc": "2.0", "id": 1, "result": \n')
            sys.stdout.flush()
