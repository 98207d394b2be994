// Layout of a transcript DAG, git-graph style: one row per entry in seq order, one lane
// per branch. The active branch keeps lane 0; another branch takes the next free lane
// where it leaves its parent. Pure functions (no DOM), so the layout can be reasoned
// about on its own.

const MAIN_KINDS = new Set(["message", "compaction", "marker", "corrupt"]);

/**
 * entries: [{seq, parent_seq, kind, on_branch, covers}] in any order.
 * Returns {rows, lanes, laneOf, rowOf, attached, coveredBy, edges}:
 *  rows      entries drawn as rows, in seq order
 *  attached  seq -> side entries (run checkpoints, custom kinds with no children) shown
 *            on their parent's row instead of a row of their own
 *  coveredBy seq -> the compaction seq whose summary stands for it
 *  edges     [{from, to}] parent -> child between drawn rows (from null: a root)
 */
export function layout(entries) {
  const sorted = [...entries].sort((a, b) => a.seq - b.seq);
  const hasChild = new Set(sorted.filter((e) => e.parent_seq !== null && e.parent_seq !== undefined).map((e) => e.parent_seq));
  const attached = new Map();
  const rows = [];
  for (const e of sorted) {
    const side = !MAIN_KINDS.has(e.kind) && !hasChild.has(e.seq) && e.parent_seq !== null && e.parent_seq !== undefined;
    if (side) {
      if (!attached.has(e.parent_seq)) attached.set(e.parent_seq, []);
      attached.get(e.parent_seq).push(e);
    } else {
      rows.push(e);
    }
  }
  const drawn = new Set(rows.map((e) => e.seq));
  const rowOf = new Map(rows.map((e, i) => [e.seq, i]));
  const laneOf = new Map();
  const continued = new Set(); // parents whose lane a child already continues
  for (const e of rows) {
    if (e.on_branch) {
      laneOf.set(e.seq, 0);
      if (drawn.has(e.parent_seq)) continued.add(e.parent_seq);
    }
  }
  let lanes = rows.some((e) => e.on_branch) ? 1 : 0;
  for (const e of rows) {
    if (laneOf.has(e.seq)) continue;
    const parent = e.parent_seq;
    if (drawn.has(parent) && !continued.has(parent)) {
      laneOf.set(e.seq, laneOf.get(parent));
      continued.add(parent);
    } else {
      laneOf.set(e.seq, lanes);
      lanes += 1;
      if (drawn.has(parent)) continued.add(parent);
    }
  }
  const coveredBy = new Map();
  for (const e of rows) {
    for (const seq of e.covers || []) if (!coveredBy.has(seq)) coveredBy.set(seq, e.seq);
  }
  const edges = rows.map((e) => ({ from: drawn.has(e.parent_seq) ? e.parent_seq : null, to: e.seq }));
  return { rows, lanes: Math.max(lanes, 1), laneOf, rowOf, attached, coveredBy, edges };
}

/** The text of a stored message: its text blocks, tool calls and results in brief. */
export function messageText(message) {
  if (!message) return "";
  const content = message.content;
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.map((b) => {
    if (!b || typeof b !== "object") return "";
    if (b.type === "text") return b.text;
    if (b.type === "tool_call") return `→ ${b.name}(${b.arguments})`;
    if (b.type === "tool_result") return `${b.is_error ? "✗ " : "← "}${b.content}`;
    if (b.type === "image") return "[image]";
    if (b.type === "file") return `[file ${b.name || ""}]`;
    return `[${b.type}]`;
  }).filter(Boolean).join(" ");
}
