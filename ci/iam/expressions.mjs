// The top-level attribute names a DynamoDB expression touches, and the partition key value a
// key condition fixes: what dynamodb:Attributes and dynamodb:LeadingKeys carry.
//
// An expression names attributes by document paths (`a.b[0]`, `#steps[3].#step_name`): the
// top-level attribute is a path's first element, a bare name or a `#placeholder` of
// ExpressionAttributeNames. Function names (`attribute_exists(`), keywords (AND, SET, ...) and
// `:values` are no attributes. Grammar:
// https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/Expressions.html

const KEYWORDS = new Set(['AND', 'OR', 'NOT', 'BETWEEN', 'IN', 'SET', 'REMOVE', 'ADD', 'DELETE'])
const TOKEN = /\s*(#[A-Za-z0-9_]+|:[A-Za-z0-9_]+|[A-Za-z_][A-Za-z0-9_]*|\d+|<>|<=|>=|[=<>(),.[\]+-])/y

export class ExpressionError extends Error {}

/** The tokens of `expression`; an unknown character is an error (never skipped). */
export function tokenize(expression) {
  const tokens = []
  TOKEN.lastIndex = 0
  while (TOKEN.lastIndex < expression.length) {
    if (/^\s*$/.test(expression.slice(TOKEN.lastIndex))) break
    const start = TOKEN.lastIndex
    const match = TOKEN.exec(expression)
    if (!match) {
      throw new ExpressionError(`cannot read ${JSON.stringify(expression)} at ${start}`)
    }
    tokens.push(match[1])
  }
  return tokens
}

/** The attribute a name token stands for (a placeholder through `names`). */
function attributeOf(token, names) {
  if (!token.startsWith('#')) return token
  const name = names?.[token]
  if (name === undefined) {
    throw new ExpressionError(`${token} is not in ExpressionAttributeNames`)
  }
  return name
}

function isName(token) {
  return /^(#|[A-Za-z_])/.test(token)
}

/** The top-level attribute names `expression` touches (a Set), `names` its placeholders. */
export function topLevelAttributes(expression, names) {
  const found = new Set()
  if (!expression) return found
  const tokens = tokenize(expression)
  tokens.forEach((token, index) => {
    if (!isName(token)) return
    const previous = tokens[index - 1]
    const next = tokens[index + 1]
    if (previous === '.') return // a nested element of a path
    if (!token.startsWith('#') && (next === '(' || KEYWORDS.has(token.toUpperCase()))) return
    found.add(attributeOf(token, names))
  })
  return found
}

/**
 * The value a key condition fixes for `partitionKey` (`#pk = :v` or `:v = #pk`), as the
 * AttributeValue in `values`; undefined when it fixes none.
 */
export function partitionKeyCondition(expression, partitionKey, names, values) {
  const tokens = tokenize(expression)
  for (let index = 0; index + 2 < tokens.length; index++) {
    const [left, operator, right] = tokens.slice(index, index + 3)
    if (operator !== '=') continue
    for (const [name, value] of [
      [left, right],
      [right, left]
    ]) {
      if (isName(name) && value.startsWith(':') && attributeOf(name, names) === partitionKey) {
        if (!(value in (values ?? {}))) {
          throw new ExpressionError(`${value} is not in ExpressionAttributeValues`)
        }
        return values[value]
      }
    }
  }
  return undefined
}
