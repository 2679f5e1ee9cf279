// Drives `blend serve`'s /v1/responses with the official OpenAI Node client: responses.create
// (output_text, usage, incomplete at max_output_tokens), stream: true and responses.stream (the
// streamed text is the whole answer's; finalResponse is complete), a function call round trip
// (tool_choice required, the call and its output sent back as input items), text.format
// json_schema, and 400 / 404 refusals. The server runs Qwen2.5's chat template (tools).
// Usage: node openai_responses.cjs BASE_URL API_KEY   (prints "openai responses: ok")
'use strict';
const assert = require('node:assert/strict');
const { OpenAI } = require('openai');

async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const model = 'tiny';
  const args = {
    model, instructions: 'Be brief', input: 'Say something', max_output_tokens: 8,
    temperature: 0, ignore_eos: true,
  };

  const whole = await client.responses.create(args);
  assert.equal(whole.object, 'response');
  assert.match(whole.id, /^resp_/);
  assert.equal(whole.status, 'incomplete');
  assert.equal(whole.incomplete_details.reason, 'max_output_tokens');
  assert.equal(whole.usage.output_tokens, 8);
  assert.equal(whole.output[0].type, 'message');
  assert.equal(whole.output_text, whole.output[0].content[0].text);
  assert.ok(whole.output_text.length > 0);

  // stream: true, read event by event.
  let text = '';
  const types = [];
  for await (const event of await client.responses.create({ ...args, stream: true })) {
    types.push(event.type);
    if (event.type === 'response.output_text.delta') text += event.delta;
  }
  assert.equal(text, whole.output_text);
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');

  // responses.stream: the helper accumulates the events into the final response.
  const stream = client.responses.stream(args);
  let deltas = '';
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const final = await stream.finalResponse();
  assert.equal(deltas, whole.output_text);
  // (This client adds output_text to a streamed response only with a parsed format.)
  assert.equal(final.output[0].content[0].text, whole.output_text);
  assert.equal(final.status, 'incomplete');
  assert.equal(final.usage.output_tokens, 8);

  // Function tools, flat: the call comes back, goes in again with its output.
  const tools = [{
    type: 'function', name: 'lookup', strict: true,
    parameters: {
      type: 'object', properties: { found: { type: 'boolean' }, kind: { enum: ['a', 'b'] } },
      required: ['found', 'kind'], additionalProperties: false,
    },
  }];
  const called = await client.responses.create({
    model, input: 'Look it up', tools, tool_choice: 'required', parallel_tool_calls: false,
    max_output_tokens: 400, seed: 1,
  });
  assert.equal(called.output.length, 1, JSON.stringify(called.output));
  const call = called.output[0];
  assert.equal(call.type, 'function_call');
  assert.equal(call.name, 'lookup');
  const callArgs = JSON.parse(call.arguments);
  assert.equal(typeof callArgs.found, 'boolean');
  const next = await client.responses.create({
    model, tools, max_output_tokens: 4,
    input: [{ role: 'user', content: 'Look it up' }, call,
            { type: 'function_call_output', call_id: call.call_id, output: '{"n": 3}' }],
  });
  assert.ok(next.usage.input_tokens > called.usage.input_tokens, JSON.stringify(next.usage));

  // Structured output.
  const structured = await client.responses.create({
    model, input: 'A thing', max_output_tokens: 400, seed: 2,
    text: {
      format: {
        type: 'json_schema', name: 'thing', strict: true,
        schema: {
          type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'],
          additionalProperties: false,
        },
      },
    },
  });
  assert.equal(structured.status, 'completed');
  assert.equal(typeof JSON.parse(structured.output_text).ok, 'boolean');

  // Refusals: a 400 naming the field; nothing to retrieve.
  await assert.rejects(client.responses.create({ ...args, previous_response_id: 'resp_1' }),
                       (e) => e.status === 400 && e.param === 'previous_response_id');
  await assert.rejects(client.responses.create({ ...args, tools: [{ type: 'web_search_preview' }] }),
                       (e) => e.status === 400 && e.param === 'tools[0].type');
  await assert.rejects(client.responses.retrieve(whole.id), (e) => e.status === 404);
  console.log('openai responses: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
