#!/usr/bin/env node
// Builds the console: the bridge and the tests with tsc (dist/src, dist/test), the page bundled
// with esbuild into dist/public/app.js beside copies of page/index.html and page/console.css,
// and the Client half frame's bootstrap into dist/frame/bootstrap.js (inlined into /frame.html
// by src/frame.ts).
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const PKG = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const DIST = join(PKG, "dist");
rmSync(DIST, { recursive: true, force: true });
const tsc = join(PKG, "node_modules", "typescript", "bin", "tsc");
execFileSync(process.execPath, [tsc, "-p", join(PKG, "tsconfig.json")], { stdio: "inherit" });
execFileSync(process.execPath, [tsc, "-p", join(PKG, "tsconfig.page.json")], { stdio: "inherit" });
mkdirSync(join(DIST, "public"), { recursive: true });
await build({
  entryPoints: [join(PKG, "page", "main.ts")],
  bundle: true,
  format: "iife",
  platform: "browser",
  target: "es2022",
  sourcemap: true,
  outfile: join(DIST, "public", "app.js"),
  logLevel: "warning",
});
await build({
  entryPoints: [join(PKG, "page", "frame.ts")],
  bundle: true,
  format: "iife",
  platform: "browser",
  target: "es2022",
  minify: true, // inlined into every frame document
  outfile: join(DIST, "frame", "bootstrap.js"),
  logLevel: "warning",
});
for (const file of ["index.html", "console.css"]) copyFileSync(join(PKG, "page", file), join(DIST, "public", file));
