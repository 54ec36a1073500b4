#!/usr/bin/env python3
"""A deliberately broken copy of a template, for the self-test: proof that the IAM check
notices a policy that is too narrow (a request the functions send is refused) or too wide (a
deny-set request is allowed). Prints the copy as JSON (CloudFormation reads JSON as it reads
YAML, and SAM's parser has already turned the short forms such as !Ref into long ones).

    mutate.py --template template.yaml drop-action LOGICAL_ID ACTION
        removes ACTION from every statement of the resource (an AWS::IAM::Policy, or a
        function's SAM Policies)
    mutate.py --template template.yaml widen-leading-keys LOGICAL_ID
        replaces every dynamodb:LeadingKeys value the resource's string conditions compare
        with by "*"

A mutation that finds nothing to change is an error (exit 2): the self-test would prove nothing.
"""

import argparse
import json
import sys

from samtranslator.yaml_helper import yaml_parse


def statements(node):
    """Every policy statement (a dict with Effect and Action) under `node`."""
    if isinstance(node, dict):
        if "Effect" in node and "Action" in node:
            yield node
        for value in node.values():
            yield from statements(value)
    elif isinstance(node, list):
        for value in node:
            yield from statements(value)


def drop_action(resource, action):
    changed = 0
    for statement in statements(resource):
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if action in actions:
            statement["Action"] = [kept for kept in actions if kept != action]
            changed += 1
    # A statement left without actions is invalid: give it one nobody sends.
    for statement in statements(resource):
        if statement["Action"] == []:
            statement["Action"] = ["dynamodb:DescribeLimits"]
    return changed


def widen_leading_keys(resource):
    changed = 0
    for statement in statements(resource):
        for name, operator in statement.get("Condition", {}).items():
            # The comparisons only (StringLike, StringEquals, ...): a Null guard stays as it is.
            if "String" in name and "dynamodb:LeadingKeys" in operator:
                operator["dynamodb:LeadingKeys"] = ["*"]
                changed += 1
    return changed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", required=True)
    parser.add_argument("mutation", choices=["drop-action", "widen-leading-keys"])
    parser.add_argument("logical_id")
    parser.add_argument("action", nargs="?")
    args = parser.parse_args()
    with open(args.template) as source:
        template = yaml_parse(source.read())
    resource = template.get("Resources", {}).get(args.logical_id)
    if resource is None:
        print(f"mutate.py: no resource {args.logical_id}", file=sys.stderr)
        return 2
    if args.mutation == "drop-action":
        if not args.action:
            parser.error("drop-action needs an ACTION")
        changed = drop_action(resource, args.action)
    else:
        changed = widen_leading_keys(resource)
    if not changed:
        print(f"mutate.py: {args.mutation} changed nothing in {args.logical_id}", file=sys.stderr)
        return 2
    json.dump(template, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
