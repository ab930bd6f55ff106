# A run_code program for the quick start's tools (examples/my_tools.py):
# `scripts/codemode run examples/programs/hello.py --agent me --create-agent`. Its value:
#   {"logs": ["Hello, world!"], "result": 5}
total = await tools.add({"a": 2, "b": 3})
print(await tools.greet({"name": "world"}))
return total
