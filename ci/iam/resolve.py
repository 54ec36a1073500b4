#!/usr/bin/env python3
"""template.yaml -> one synthetic stack, as JSON: each function's physical name, role and every
identity policy that applies to it (intrinsics resolved), and the tables, queues, topics and
buses the requests may name.

SAM's own translator (aws-sam-translator, pinned in requirements.txt) expands the SAM
resources: policy templates, generated roles `<Function>Role`, event sources' permissions.
Nothing of SAM is expanded by hand here; only CloudFormation's intrinsics are resolved
(intrinsics.py), with the physical names the recordings show (naming.py).

    resolve.py --template template.yaml [--hints hints.json] [--parameter Name=Value]...

hints.json is a list: one entry per deployment to resolve (each recording is one deployment
with names of its own), {"label": ..., "functions": {binary: {"function_name": ..., "env":
{...}}}}; the
output is the list of their stacks, in order (without --hints: one stack, all names
synthetic). SAM's transform runs once for all of them.

Errors (a template or a recording this cannot resolve faithfully) exit 2 with the reason.
"""

import argparse
import copy
import json
import os
import sys

# The translator fills in pseudo parameters from a boto3 session: give it the synthetic Region
# and no way to look for credentials or metadata (it needs neither: nothing is deployed).
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

from samtranslator.translator.transform import transform  # noqa: E402
from samtranslator.yaml_helper import yaml_parse  # noqa: E402

from intrinsics import ResolveError, Stack  # noqa: E402
from naming import Names, learn_from_hints  # noqa: E402
from policies import PolicySource, check_modelled, role_of  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ACCOUNT, REGION, PARTITION = "123456789012", "us-east-1", "aws"


class NoManagedPolicyLookups:
    """SAM asks IAM for managed policy ARNs only for policies named by bare name; this
    template's are not, and this check never calls AWS."""

    def load(self):
        raise ResolveError("SAM asked IAM for the managed policies' ARNs: name them by ARN in the template")


def load_template(path):
    with open(path) as source:
        template = yaml_parse(source.read())
    # As `sam validate` does: a local CodeUri is a path `sam package` would upload; the
    # translator only accepts S3 URIs. The code is irrelevant to IAM.
    for resource in template.get("Resources", {}).values():
        properties = resource.get("Properties") or {}
        if resource.get("Type") == "AWS::Serverless::Function" and isinstance(properties.get("CodeUri"), str):
            if not properties["CodeUri"].startswith("s3://"):
                properties["CodeUri"] = "s3://iam-check/" + properties["CodeUri"]
    globals_function = template.get("Globals", {}).get("Function", {})
    if isinstance(globals_function.get("CodeUri"), str) and not globals_function["CodeUri"].startswith("s3://"):
        globals_function["CodeUri"] = "s3://iam-check/" + globals_function["CodeUri"]
    return template


def parameter_values(template, overrides):
    values = {
        name: definition["Default"]
        for name, definition in template.get("Parameters", {}).items()
        if "Default" in definition
    }
    for override in overrides:
        name, _, value = override.partition("=")
        if name not in template.get("Parameters", {}):
            raise ResolveError(f"--parameter {name}: the template has no such parameter")
        values[name] = value
    missing = [name for name in template.get("Parameters", {}) if name not in values]
    if missing:
        raise ResolveError(f"parameters without a default need --parameter: {', '.join(missing)}")
    return values


def pseudo_parameters(stack_name):
    return {
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::Partition": PARTITION,
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackName": stack_name,
        "AWS::StackId": f"arn:{PARTITION}:cloudformation:{REGION}:{ACCOUNT}:stack/{stack_name}/00000000-0000-0000-0000-000000000000",
        "AWS::NotificationARNs": [],
        "AWS::NoValue": None,
    }


def translate(template, parameters, stack_name):
    if "Transform" not in template:
        return template
    pseudo = {key: value for key, value in pseudo_parameters(stack_name).items() if key != "AWS::NoValue"}
    return transform(copy.deepcopy(template), {**parameters, **pseudo}, NoManagedPolicyLookups())


def describe_tables(stack):
    tables = {}
    for logical, resource in stack.resources.items():
        if resource["Type"] != "AWS::DynamoDB::Table" or not stack.deployed(logical):
            continue
        properties = stack.resolve(resource["Properties"])
        keys = {element["KeyType"]: element["AttributeName"] for element in properties["KeySchema"]}
        indexes = [
            index["IndexName"]
            for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes")
            for index in properties.get(kind, [])
        ]
        # A Query on an index fixes the index's partition key: dynamodb:LeadingKeys is its value.
        index_partition_keys = {
            index["IndexName"]: next(
                element["AttributeName"] for element in index["KeySchema"] if element["KeyType"] == "HASH"
            )
            for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes")
            for index in properties.get(kind, [])
        }
        name = stack.physical_name(logical)
        tables[name] = {
            "logical": logical,
            "arn": stack.get_att(logical, "Arn"),
            "partition_key": keys["HASH"],
            "sort_key": keys.get("RANGE"),
            "indexes": indexes,
            "index_partition_keys": index_partition_keys,
            "stream_arn": stack.get_att(logical, "StreamArn") if "StreamSpecification" in properties else None,
        }
    return tables


def describe(stack, kind, arn_attribute):
    found = {}
    for logical, resource in stack.resources.items():
        if resource["Type"] == kind and stack.deployed(logical):
            found[stack.physical_name(logical)] = {"logical": logical, "arn": stack.get_att(logical, arn_attribute)}
    return found


def describe_functions(stack, policy_source):
    functions = {}
    for logical, resource in stack.resources.items():
        if resource["Type"] != "AWS::Lambda::Function" or not stack.deployed(logical):
            continue
        binary = resource.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
        role = role_of(stack, logical)
        role_name = stack.physical_name(role)
        name = stack.physical_name(logical)
        policies, boundaries = policy_source.of_role(role)
        environment = stack.resolve_map(stack.resolve_map(resource["Properties"].get("Environment", {})).get("Variables", {}))
        functions[logical] = {
            "binary": binary,
            "name": name,
            "role": {"logical": role, "name": role_name, "arn": stack.get_att(role, "Arn")},
            # Lambda runs the function as a session of its role.
            "principal": f"arn:{PARTITION}:sts::{ACCOUNT}:assumed-role/{role_name}/{name}",
            "environment": environment,
            "policies": policies,
            "permission_boundaries": boundaries,
        }
    binaries = [function["binary"] for function in functions.values() if function["binary"]]
    duplicates = sorted({binary for binary in binaries if binaries.count(binary) > 1})
    if duplicates:
        raise ResolveError(f"several functions build the binary {', '.join(duplicates)}")
    return functions


def resolve(template_path, hints_list, overrides, stack_name, managed_dir):
    """One stack per entry of `hints_list`, from one transform of the template."""
    template = load_template(template_path)
    parameters = parameter_values(template, overrides)
    transformed = translate(template, parameters, stack_name)
    stacks = []
    for hints in hints_list:
        try:
            stacks.append(resolve_one(template_path, transformed, parameters, hints, stack_name, managed_dir))
        except ResolveError as err:
            raise ResolveError(f"{hints.get('label', 'the stack')}: {err}") from None
    return stacks


def resolve_one(template_path, transformed, parameters, hints, stack_name, managed_dir):
    names = Names(stack_name)
    learn_from_hints(names, transformed, hints)
    stack = Stack(transformed, parameters, pseudo_parameters(stack_name), names)
    check_modelled(stack)
    default_bus = f"arn:{PARTITION}:events:{REGION}:{ACCOUNT}:event-bus/default"
    return {
        "template": template_path,
        "account": ACCOUNT,
        "region": REGION,
        "partition": PARTITION,
        "parameters": parameters,
        "conditions": {name: stack.condition(name) for name in transformed.get("Conditions", {})},
        "functions": describe_functions(stack, PolicySource(stack, managed_dir)),
        "tables": describe_tables(stack),
        "queues": describe(stack, "AWS::SQS::Queue", "Arn"),
        "topics": describe(stack, "AWS::SNS::Topic", "TopicArn"),
        "buses": {"default": {"logical": None, "arn": default_bus}, **describe(stack, "AWS::Events::EventBus", "Arn")},
        "names": {logical: {"name": name, "learned_from": source} for logical, (name, source) in sorted(names.learned.items())},
        "warnings": names.warnings,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", required=True)
    parser.add_argument("--hints", help="JSON list, one per deployment: {functions: {binary: {function_name, env}}}")
    parser.add_argument("--parameter", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--stack-name", default="lambda-idempotency")
    parser.add_argument("--managed-policies", default=os.path.join(HERE, "managed-policies"))
    args = parser.parse_args()
    hints_list = [{}]
    if args.hints:
        with open(args.hints) as source:
            hints_list = json.load(source)
    try:
        stacks = resolve(args.template, hints_list, args.parameter, args.stack_name, args.managed_policies)
    except ResolveError as err:
        print(f"resolve.py: {err}", file=sys.stderr)
        return 2
    json.dump(stacks, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
