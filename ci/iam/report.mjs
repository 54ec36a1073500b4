// The verdict table: one row per authorization (or per deny-set entry), aligned columns.

/** The part of an ARN after its account (`table/name`, `orders-queue`), or the whole string. */
export function shortResource(resource) {
  const parts = resource.split(':')
  return parts.length >= 6 ? parts.slice(5).join(':') : resource
}

function shorten(text, width) {
  return text.length > width ? `${text.slice(0, width - 1)}…` : text
}

/** Prints `rows` (objects) under `columns` ([{key, title, width?}]). */
export function printTable(rows, columns, out = console.log) {
  const cells = rows.map((row) => columns.map((column) => shorten(String(row[column.key] ?? ''), column.width ?? 200)))
  const widths = columns.map((column, index) => Math.max(column.title.length, ...cells.map((cell) => cell[index].length)))
  const line = (values) => values.map((value, index) => value.padEnd(widths[index])).join('  ').trimEnd()
  out(line(columns.map((column) => column.title)))
  out(line(widths.map((width) => '-'.repeat(width))))
  for (const cell of cells) out(line(cell))
}

export const VERDICTS = {
  Allowed: 'allowed',
  ImplicitlyDenied: 'DENIED',
  ExplicitlyDenied: 'DENIED (explicit)'
}
