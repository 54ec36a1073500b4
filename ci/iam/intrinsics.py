"""CloudFormation's intrinsic functions over a transformed (plain CloudFormation) template.

SAM's translator expands the SAM resources, but it leaves CloudFormation's own intrinsics
(Ref, Fn::GetAtt, Fn::Sub, Fn::If, ...) for CloudFormation to resolve at deploy time. This
module resolves them the way CloudFormation would in one synthetic stack: each resource's
physical name is given by `names` (from the recordings, or synthetic), and the pseudo
parameters are fixed (us-east-1, account 123456789012, partition aws).

Resolution is lazy: only the values the IAM check reads (policies, environments, key schemas)
are resolved, and anything this module does not model is an error, never a guess.
"""

import base64
from urllib.parse import urlparse


class ResolveError(Exception):
    """A value this resolver cannot produce as CloudFormation would."""


# AWS::NoValue: removes the property or list element it stands for.
NO_VALUE = object()

# The physical name CloudFormation uses for each modelled resource type (its name property),
# and what Ref returns for it.
NAME_PROPERTY = {
    "AWS::DynamoDB::Table": "TableName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::IAM::Role": "RoleName",
    "AWS::IAM::ManagedPolicy": "ManagedPolicyName",
    "AWS::IAM::Policy": "PolicyName",
    "AWS::Events::EventBus": "Name",
    "AWS::ApiGatewayV2::Api": None,
}


class Stack:
    """One synthetic deployment of a transformed template."""

    def __init__(self, template, parameters, pseudo, names):
        self.template = template
        self.resources = template.get("Resources", {})
        self.parameters = parameters
        self.pseudo = pseudo
        self.names = names
        self._conditions = {}
        # The Condition function is only valid inside the Conditions section: elsewhere a
        # one-key {"Condition": ...} is data (it cannot be in a policy statement, which also
        # has an Effect, but a property might be).
        self._in_conditions = 0

    # -- conditions -------------------------------------------------------------------------

    def condition(self, name):
        if name not in self._conditions:
            definitions = self.template.get("Conditions", {})
            if name not in definitions:
                raise ResolveError(f"no condition {name} in the template")
            self._in_conditions += 1
            try:
                self._conditions[name] = bool(self.resolve(definitions[name]))
            finally:
                self._in_conditions -= 1
        return self._conditions[name]

    def deployed(self, logical):
        """Whether the resource exists in this stack (its Condition, if any, holds)."""
        resource = self.resources.get(logical)
        if resource is None:
            return False
        condition = resource.get("Condition")
        return condition is None or self.condition(condition)

    # -- names and attributes ---------------------------------------------------------------

    def _resource(self, logical):
        if logical not in self.resources:
            raise ResolveError(f"no resource {logical} in the template")
        if not self.deployed(logical):
            raise ResolveError(f"{logical} is not deployed with these parameters (its Condition is false)")
        return self.resources[logical]

    def physical_name(self, logical):
        resource = self._resource(logical)
        kind = resource["Type"]
        if kind not in NAME_PROPERTY:
            raise ResolveError(f"{logical}: resources of type {kind} are not modelled")
        prop = NAME_PROPERTY[kind]
        if prop and prop in resource.get("Properties", {}):
            return self.resolve(resource["Properties"][prop])
        return self.names.physical(logical, kind)

    def ref(self, name):
        if name in self.pseudo:
            value = self.pseudo[name]
            return NO_VALUE if value is None else value
        if name in self.parameters:
            return self.parameters[name]
        resource = self._resource(name)
        kind = resource["Type"]
        physical = self.physical_name(name)
        region, account, partition = self.pseudo["AWS::Region"], self.pseudo["AWS::AccountId"], self.pseudo["AWS::Partition"]
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{region}.amazonaws.com/{account}/{physical}"
        if kind == "AWS::SNS::Topic":
            return f"arn:{partition}:sns:{region}:{account}:{physical}"
        if kind == "AWS::IAM::ManagedPolicy":
            return f"arn:{partition}:iam::{account}:policy/{physical}"
        # Tables, functions, roles, buses, policies, APIs: Ref is the name (or id).
        return physical

    def get_att(self, logical, attribute):
        resource = self._resource(logical)
        kind = resource["Type"]
        name = self.physical_name(logical)
        region, account, partition = self.pseudo["AWS::Region"], self.pseudo["AWS::AccountId"], self.pseudo["AWS::Partition"]
        attributes = {}
        if kind == "AWS::DynamoDB::Table":
            arn = f"arn:{partition}:dynamodb:{region}:{account}:table/{name}"
            attributes["Arn"] = arn
            if "StreamSpecification" in resource.get("Properties", {}):
                # A stream's label is the time it was enabled: a fixed one in a synthetic stack.
                attributes["StreamArn"] = f"{arn}/stream/1970-01-01T00:00:00.000"
        elif kind == "AWS::SQS::Queue":
            attributes["Arn"] = f"arn:{partition}:sqs:{region}:{account}:{name}"
            attributes["QueueName"] = name
            attributes["QueueUrl"] = self.ref(logical)
        elif kind == "AWS::SNS::Topic":
            attributes["TopicArn"] = self.ref(logical)
            attributes["TopicName"] = name
        elif kind == "AWS::Lambda::Function":
            attributes["Arn"] = f"arn:{partition}:lambda:{region}:{account}:function:{name}"
        elif kind == "AWS::IAM::Role":
            attributes["Arn"] = f"arn:{partition}:iam::{account}:role/{name}"
        elif kind == "AWS::Events::EventBus":
            attributes["Arn"] = f"arn:{partition}:events:{region}:{account}:event-bus/{name}"
            attributes["Name"] = name
        if attribute not in attributes:
            raise ResolveError(f"Fn::GetAtt {logical}.{attribute} ({kind}) is not modelled")
        return attributes[attribute]

    # -- the intrinsics ---------------------------------------------------------------------

    def resolve(self, value):
        """`value` with every intrinsic resolved; NO_VALUE where AWS::NoValue stands."""
        if isinstance(value, list):
            return [item for item in (self.resolve(v) for v in value) if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, argument), = value.items()
            if key == "Ref":
                return self.ref(argument)
            if key == "Condition" and self._in_conditions:
                return self.condition(argument)
            if key.startswith("Fn::"):
                handler = getattr(self, "_fn_" + key[4:].lower(), None)
                if handler is None:
                    raise ResolveError(f"{key} is not modelled")
                return handler(argument)
        resolved = {}
        for key, item in value.items():
            item = self.resolve(item)
            if item is not NO_VALUE:
                resolved[key] = item
        return resolved

    def resolve_list(self, value):
        """A list property resolved (AWS::NoValue for the whole property: no list)."""
        resolved = self.resolve(value)
        if resolved is NO_VALUE:
            return []
        return resolved if isinstance(resolved, list) else [resolved]

    def resolve_map(self, value):
        """A map property resolved (AWS::NoValue for the whole property: no map)."""
        resolved = self.resolve(value)
        return {} if resolved is NO_VALUE else resolved

    def _fn_getatt(self, argument):
        if isinstance(argument, str):
            argument = argument.split(".", 1)
        logical, attribute = (self.resolve(part) for part in argument)
        return self.get_att(logical, attribute)

    def _fn_if(self, argument):
        name, when_true, when_false = argument
        return self.resolve(when_true if self.condition(name) else when_false)

    def _fn_equals(self, argument):
        left, right = (self.resolve(part) for part in argument)
        return str(left) == str(right)

    def _fn_not(self, argument):
        return not self.resolve(argument[0])

    def _fn_and(self, argument):
        return all(self.resolve(part) for part in argument)

    def _fn_or(self, argument):
        return any(self.resolve(part) for part in argument)

    def _fn_join(self, argument):
        delimiter, parts = argument
        return self.resolve(delimiter).join(str(part) for part in self.resolve(parts))

    def _fn_select(self, argument):
        index, items = argument
        return self.resolve(items)[int(self.resolve(index))]

    def _fn_split(self, argument):
        delimiter, text = argument
        return self.resolve(text).split(self.resolve(delimiter))

    def _fn_findinmap(self, argument):
        name, first, second = (self.resolve(part) for part in argument)
        try:
            return self.template["Mappings"][name][first][second]
        except KeyError as missing:
            raise ResolveError(f"Fn::FindInMap {name}/{first}/{second}: no {missing}") from None

    def _fn_base64(self, argument):
        return base64.b64encode(str(self.resolve(argument)).encode()).decode()

    def _fn_sub(self, argument):
        if isinstance(argument, list):
            text, variables = argument
            variables = {key: self.resolve(item) for key, item in variables.items()}
        else:
            text, variables = argument, {}
        out, rest = [], text
        while "${" in rest:
            before, _, after = rest.partition("${")
            name, closed, rest = after.partition("}")
            if not closed:
                raise ResolveError(f"Fn::Sub: unclosed ${{ in {text!r}")
            out.append(before)
            if name.startswith("!"):
                out.append("${" + name[1:] + "}")
            elif name in variables:
                out.append(str(variables[name]))
            elif "." in name and not name.startswith("AWS::"):
                out.append(str(self.get_att(*name.split(".", 1))))
            else:
                out.append(str(self.ref(name)))
        out.append(rest)
        return "".join(out)


def queue_name_of_url(url):
    """The queue name an SQS queue URL ends with (host and account are the endpoint's)."""
    path = urlparse(url).path.rstrip("/")
    name = path.rsplit("/", 1)[-1]
    if not name:
        raise ResolveError(f"{url!r} is no queue URL")
    return name
