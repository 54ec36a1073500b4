"""Physical names for the synthetic stack: those the recordings show, else deterministic ones.

A recording names its function (`function_name`) and, through the function's environment
(`IDEMPOTENCY_TABLE=...`), the resources the template hands it (`IDEMPOTENCY_TABLE: !Ref
IdempotencyTable`). Those names are what the requests carry, so the stack must use them; a
resource no recording names gets `<stack name>-<logical id>`.
"""

from intrinsics import ResolveError, queue_name_of_url


class Names:
    def __init__(self, stack_name):
        self.stack_name = stack_name
        self.learned = {}  # logical id -> (physical name, where it was learned)
        self.warnings = []

    def learn(self, logical, name, source):
        known = self.learned.get(logical)
        if known and known[0] != name:
            raise ResolveError(
                f"{logical} has two names in the recordings: {known[0]!r} ({known[1]}) and {name!r} ({source})"
            )
        self.learned[logical] = (name, source)

    def physical(self, logical, kind):
        if logical in self.learned:
            return self.learned[logical][0]
        return f"{self.stack_name}-{logical}"


def name_from_value(kind, attribute, value):
    """The physical name inside what Ref/GetAtt of a resource of `kind` returned (`value`)."""
    if kind == "AWS::SQS::Queue" and attribute in (None, "QueueUrl"):
        return queue_name_of_url(value)
    if attribute == "Arn" or kind == "AWS::SNS::Topic" and attribute in (None, "TopicArn"):
        # arn:...:table/NAME, arn:...:sqs:REGION:ACCOUNT:NAME, arn:...:function:NAME
        return value.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    if attribute in (None, "QueueName", "TopicName", "Name"):
        return value
    raise ResolveError(f"cannot learn a {kind}'s name from its {attribute}")


def learn_from_hints(names, template, hints):
    """Learns names from the recordings' hints ({binary: {function_name, env}})."""
    resources = template.get("Resources", {})
    functions = {}
    for logical, resource in resources.items():
        if resource.get("Type") != "AWS::Lambda::Function":
            continue
        binary = resource.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
        if binary:
            functions[binary] = logical
    declared_anywhere = {
        var
        for resource in resources.values()
        if resource.get("Type") == "AWS::Lambda::Function"
        for var in resource.get("Properties", {}).get("Environment", {}).get("Variables", {})
    }
    for binary, hint in sorted(hints.get("functions", {}).items()):
        if binary not in functions:
            raise ResolveError(f"the recordings name binary {binary!r}, which no function of the template builds")
        logical = functions[binary]
        source = f"the recordings of {binary}"
        names.learn(logical, hint["function_name"], source)
        variables = resources[logical].get("Properties", {}).get("Environment", {}).get("Variables", {})
        for var, value in sorted(hint.get("env", {}).items()):
            if value is None:
                continue
            if var not in variables:
                if var in declared_anywhere:
                    names.warnings.append(
                        f"{binary} ran with {var}={value!r}, which the template does not set for {logical}: "
                        f"a request that uses it is not one the deployed function sends"
                    )
                else:
                    names.warnings.append(f"{binary} ran with {var}, which no function of the template has (not used)")
                continue
            _learn_variable(names, resources, variables[var], value, f"{source}, {var}")


def _learn_variable(names, resources, expression, value, source):
    if isinstance(expression, str):
        if expression != value:
            names.warnings.append(f"{source}: {value!r}, where the template sets {expression!r}")
        return
    if isinstance(expression, dict) and len(expression) == 1:
        (function, argument), = expression.items()
        if function == "Ref" and argument in resources:
            kind = resources[argument]["Type"]
            names.learn(argument, name_from_value(kind, None, value), source)
            return
        if function == "Fn::GetAtt":
            logical, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
            if logical in resources:
                kind = resources[logical]["Type"]
                names.learn(logical, name_from_value(kind, attribute, value), source)
                return
    raise ResolveError(f"{source}: cannot learn a resource's name from the template's {expression!r}")
