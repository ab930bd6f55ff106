// A run_code program: `codemode run examples/programs/count_todos.ts --agent ts-coder --create-agent`
// against `codemode up` (it offers TypeScript where its runtimes serve it, i.e. Node is installed)
// with the demo provider (`python -m codemode_client.demo_tools ADDR`).
// It fans out over the agent's tools and returns only the summary to the model. Its value:
//   {"logs": ["3 files in the workspace"], "result": {"files_with_todos": {"README.md": 1, "src/app.py": 2}, "total": 3}}
const files: string[] = await tools.list_files({});
console.log(`${files.length} files in the workspace`);
const texts: { text: string }[] = await Promise.all(files.map((path) => tools.read_file({ path })));
const todos: Record<string, number> = {};
files.forEach((path, i) => {
  const count = texts[i].text.split("TODO").length - 1;
  if (count > 0) todos[path] = count;
});
return { files_with_todos: todos, total: Object.values(todos).reduce((sum, n) => sum + n, 0) };
