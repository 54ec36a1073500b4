"""Every identity policy that applies to a function's execution role, resolved.

IAM evaluates the union of a role's policies, wherever the template declares them:
- the role's inline `Policies` (SAM puts a function's `Policies` statements and its event
  sources' generated statements there);
- the managed policies in `ManagedPolicyArns`: AWS managed ones (SAM adds
  AWSLambdaBasicExecutionRole and each event source's execution role) come from the JSON
  documents in managed-policies/, customer managed ones from their AWS::IAM::ManagedPolicy;
- every AWS::IAM::Policy and AWS::IAM::ManagedPolicy whose `Roles` names the role (the own-keys
  policies, which cannot be inline because they name the function);
- a permissions boundary, if the role has one.
"""

import json
import os

from intrinsics import ResolveError

AWS_MANAGED_PREFIX = ":iam::aws:policy/"

# Resources whose policies IAM also evaluates for the functions' requests. None is modelled
# yet: a template with one must fail here instead of being evaluated without it.
UNMODELLED_POLICY_TYPES = {
    "AWS::SQS::QueuePolicy",
    "AWS::SNS::TopicPolicy",
    "AWS::Events::EventBusPolicy",
    "AWS::DynamoDB::GlobalTable",
}


def check_modelled(stack):
    for logical, resource in stack.resources.items():
        if not stack.deployed(logical):
            continue
        kind = resource["Type"]
        properties = resource.get("Properties", {})
        if kind in UNMODELLED_POLICY_TYPES or (
            kind == "AWS::DynamoDB::Table"
            and ("ResourcePolicy" in properties or "ResourcePolicy" in properties.get("StreamSpecification", {}))
        ):
            raise ResolveError(f"{logical} ({kind}) carries a resource policy, which the IAM check does not model yet")


def role_of(stack, function_logical):
    role = stack.resources[function_logical]["Properties"].get("Role")
    if isinstance(role, dict) and list(role) == ["Fn::GetAtt"]:
        argument = role["Fn::GetAtt"]
        logical, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
        if attribute == "Arn":
            return logical
    raise ResolveError(f"{function_logical}: its Role {role!r} is not a role of the template")


class PolicySource:
    def __init__(self, stack, managed_dir):
        self.stack = stack
        self.managed_dir = managed_dir

    def managed(self, arn):
        """The document of the managed policy `arn` names."""
        if AWS_MANAGED_PREFIX in arn:
            name = arn.rsplit("/", 1)[-1]
            path = os.path.join(self.managed_dir, f"{name}.json")
            if not os.path.isfile(path):
                raise ResolveError(f"AWS managed policy {arn}: no document in {self.managed_dir} (add {name}.json)")
            with open(path) as document:
                return {"name": name, "source": "aws-managed", "document": json.load(document)}
        for logical, resource in self.stack.resources.items():
            if resource["Type"] == "AWS::IAM::ManagedPolicy" and self.stack.deployed(logical):
                if self.stack.ref(logical) == arn:
                    return self._document(logical, "managed")
        raise ResolveError(f"managed policy {arn} is neither AWS managed nor declared in the template")

    def _document(self, logical, source):
        document = self.stack.resolve(self.stack.resources[logical]["Properties"]["PolicyDocument"])
        return {"name": logical, "source": source, "document": document}

    def of_role(self, role_logical):
        """(identity policies, permissions boundaries) of the role."""
        stack = self.stack
        role_name = stack.physical_name(role_logical)
        properties = stack.resources[role_logical].get("Properties", {})
        found = []
        for inline in stack.resolve_list(properties.get("Policies", [])):
            found.append(
                {"name": f"{role_logical}/{inline['PolicyName']}", "source": "inline", "document": inline["PolicyDocument"]}
            )
        for arn in stack.resolve_list(properties.get("ManagedPolicyArns", [])):
            found.append(self.managed(arn))
        for logical, resource in stack.resources.items():
            if resource["Type"] not in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
                continue
            if not stack.deployed(logical):
                continue
            if role_name in stack.resolve_list(resource.get("Properties", {}).get("Roles", [])):
                found.append(self._document(logical, "attached"))
        # A customer managed policy both in ManagedPolicyArns and naming the role is one policy.
        unique = list({policy["name"]: policy for policy in found}.values())
        boundaries = [self.managed(arn) for arn in stack.resolve_list(properties.get("PermissionsBoundary", []))]
        return unique, boundaries
