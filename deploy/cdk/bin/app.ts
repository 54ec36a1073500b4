// The example stack in the AWS CDK (lib/stack.ts): what template.yaml deploys on the relay
// path, each function built by cargo-lambda-cdk's RustFunction from functions/ with the same
// least-privilege policies. scripts/cdk-synth.sh (run by CI) synthesises it, bundling through
// the local cargo-lambda, and evaluates the synthesised template with the IAM check that
// evaluates template.yaml.
import { App } from 'aws-cdk-lib';

import { ExampleStack } from '../lib/stack';

const app = new App({ analyticsReporting: false });
new ExampleStack(app, 'LambdaIdempotencyExample');
