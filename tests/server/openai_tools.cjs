// Tool calling through `blend serve` (Qwen2.5's chat template, on the tiny random model) with
// the official OpenAI Node client: tool_choice "required" and a named function always give
// calls (one, or several with parallel_tool_calls), streamed calls match the non-streamed ones,
// a full round trip (tools -> tool_calls -> the tool's result -> the next reply), and bad
// requests are 400s naming the field. Writes every call's arguments with its schema to
// OUT_FILE for tests/grammar/validate_json.py (python3-jsonschema) to check.
// Usage: node openai_tools.cjs BASE_URL API_KEY OUT_FILE
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { OpenAI } = require('openai');

// Random weights seldom close a string: every string is bounded (maxLength), as in the
// structured-output tests.
const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 8 },
    unit: { enum: ['c', 'f'] },
    days: { type: 'integer' },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const lookup = {
  type: 'object',
  properties: { id: { type: 'integer' }, tags: { type: 'array', items: { type: 'boolean' }, maxItems: 3 } },
  required: ['id'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: weather } },
  { type: 'function', function: { name: 'lookup', parameters: lookup } },
];
const schemaOf = { get_weather: weather, lookup };

async function main() {
  const [baseURL, apiKey, outFile] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300000 });
  const model = 'tiny';
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const base = { model, messages, tools, max_tokens: 1200, temperature: 1 };
  const outputs = [];
  const check = (message, finish, names) => {
    assert.equal(finish, 'tool_calls', JSON.stringify(message));
    assert.equal(message.content, null);
    assert.ok(message.tool_calls.length >= 1);
    for (const call of message.tool_calls) {
      assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(call.type, 'function');
      assert.ok(names.includes(call.function.name), call.function.name);
      JSON.parse(call.function.arguments);
      outputs.push({ schema: schemaOf[call.function.name], text: call.function.arguments });
    }
  };

  // required, one call: always exactly one parseable call of a listed function.
  for (let seed = 0; seed < 4; ++seed) {
    const r = await client.chat.completions.create({
      ...base, seed, tool_choice: 'required', parallel_tool_calls: false,
    });
    check(r.choices[0].message, r.choices[0].finish_reason, ['get_weather', 'lookup']);
    assert.equal(r.choices[0].message.tool_calls.length, 1);
  }
  // A named function: that one.
  for (let seed = 0; seed < 2; ++seed) {
    const r = await client.chat.completions.create({
      ...base, seed, tool_choice: { type: 'function', function: { name: 'lookup' } },
    });
    check(r.choices[0].message, r.choices[0].finish_reason, ['lookup']);
    assert.equal(r.choices[0].message.tool_calls.length, 1);  // a named function: one call
  }
  // required with parallel calls allowed (the default): one or more, all valid.
  const several = await client.chat.completions.create({ ...base, seed: 7, tool_choice: 'required' });
  check(several.choices[0].message, several.choices[0].finish_reason, ['get_weather', 'lookup']);

  // Streamed: the tool_call deltas (by index) add up to the same calls as the whole answer.
  const whole = await client.chat.completions.create({ ...base, seed: 3, tool_choice: 'required' });
  const streamed = [];
  let finish = null;
  let content = '';
  const stream = await client.chat.completions.create({
    ...base, seed: 3, tool_choice: 'required', stream: true,
  });
  for await (const chunk of stream) {
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    content += c.delta.content ?? '';
    for (const t of c.delta.tool_calls ?? []) {
      streamed[t.index] ??= { id: t.id, name: '', arguments: '' };
      streamed[t.index].name += t.function?.name ?? '';
      streamed[t.index].arguments += t.function?.arguments ?? '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  assert.deepEqual(streamed.map((s) => [s.name, s.arguments]),
                   whole.choices[0].message.tool_calls.map((t) => [t.function.name, t.function.arguments]));

  // The round trip: the reply's calls go back with the tool's result; the next reply comes.
  const first = await client.chat.completions.create({
    ...base, seed: 1, tool_choice: 'required', parallel_tool_calls: false,
  });
  check(first.choices[0].message, first.choices[0].finish_reason, ['get_weather', 'lookup']);
  const call = first.choices[0].message.tool_calls[0];
  const next = await client.chat.completions.create({
    ...base, max_tokens: 16, seed: 1,
    messages: [...messages, first.choices[0].message,
               { role: 'tool', tool_call_id: call.id, content: '{"temp": 18}' }],
  });
  assert.equal(next.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason));
  // The call and its result are in the prompt: it is longer than the first by at least them.
  assert.ok(next.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens,
            JSON.stringify([first.usage, next.usage]));
  // "auto": the model may answer or call; either way a well-formed reply.
  const chosen = await client.chat.completions.create({ ...base, max_tokens: 16, seed: 2 });
  assert.equal(chosen.choices[0].message.role, 'assistant');

  // Bad requests: 400 naming the field.
  const rejects = (body, param) => assert.rejects(
    client.chat.completions.create({ ...base, ...body }),
    (e) => e.status === 400 && e.param === param || assert.fail(`${e.status} ${e.param} ${e.message}`));
  await rejects({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'string' } } }] },
                'tools[0].function.parameters');
  await rejects({ tools: [{ type: 'function', function: { name: 'f', parameters: {
    type: 'object', properties: { a: { type: 'string', pattern: 'x+' } } } } }], tool_choice: 'required' },
                'tools[0].function.parameters');
  await rejects({ tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice');
  await rejects({ response_format: { type: 'json_object' } }, 'response_format');
  await rejects({ messages: [...messages, { role: 'tool', content: 'x' }] }, 'messages[1].tool_call_id');

  fs.writeFileSync(outFile, JSON.stringify(outputs));
  console.log(`openai tools: ok (${outputs.length} calls)`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
