// A TypeScript run_code program for the quick start's tools (examples/my_tools.py):
// `scripts/codemode run examples/programs/hello.ts --agent me-ts --create-agent`. Its value:
//   {"logs": ["Hello, world!"], "result": 5}
const total = (await tools.add({ a: 2, b: 3 })) as number;
console.log(await tools.greet({ name: "world" }));
return total;
