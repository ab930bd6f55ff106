# A run_code program: `codemode run examples/programs/count_todos.py --agent coder --create-agent`
# against a registry with the demo provider (`python -m codemode_client.demo_tools ADDR`).
# It fans out over the agent's tools and returns only the summary to the model. Its value:
#   {"logs": ["3 files in the workspace"], "result": {"files_with_todos": {"README.md": 1, "src/app.py": 2}, "total": 3}}
import asyncio

files = await tools.list_files({})
print(f"{len(files)} files in the workspace")
texts = await asyncio.gather(*(tools.read_file({"path": p}) for p in files))
todos = {p: t["text"].count("TODO") for p, t in zip(files, texts, strict=True) if "TODO" in t["text"]}
return {"files_with_todos": todos, "total": sum(todos.values())}
