// Structured output and several samples through `blend serve` with the official OpenAI Node
// client: response_format json_object and json_schema (chat, completions, streamed, in a Batch
// API line), a refused schema keyword, and n > 1. Writes every constrained output with its
// schema to OUT_FILE for tests/grammar/validate_json.py (python3-jsonschema) to check.
// Usage: node openai_structured.cjs BASE_URL API_KEY SCHEMAS_JSON OUT_FILE
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { OpenAI, toFile } = require('openai');

async function main() {
  const [baseURL, apiKey, schemasFile, outFile] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300000 });
  const schemas = JSON.parse(fs.readFileSync(schemasFile, 'utf8'));
  const model = 'tiny';
  const messages = [{ role: 'user', content: 'Answer in JSON' }];
  const base = { model, messages, max_tokens: 1500, temperature: 1 };
  const outputs = [];
  // Random weights seldom pick a closing quote or bracket among 128K tokens, so json_object
  // requests (strings of any length, any nesting) favour the '"', ']' and '}' tokens (ids 1,
  // 60, 92): their values end within max_tokens.
  const quoteBias = { logit_bias: { 1: 8, 60: 8, 92: 8 } };

  // json_object: any JSON object.
  for (let seed = 0; seed < 3; ++seed) {
    const r = await client.chat.completions.create({
      ...base, ...quoteBias, seed, response_format: { type: 'json_object' },
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    outputs.push({ schema: null, text: r.choices[0].message.content });
  }

  // json_schema, strict, every schema of the set, two seeds each.
  for (const [i, schema] of schemas.entries()) {
    for (let seed = 0; seed < 2; ++seed) {
      const r = await client.chat.completions.create({
        ...base, seed,
        response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
      });
      assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
      outputs.push({ schema, text: r.choices[0].message.content });
    }
  }

  // Completions take response_format too (as in vLLM).
  const completion = await client.completions.create({
    model, prompt: 'JSON:', max_tokens: 1500, temperature: 1, seed: 3,
    response_format: { type: 'json_schema', json_schema: { name: 's0', schema: schemas[0] } },
  });
  outputs.push({ schema: schemas[0], text: completion.choices[0].text });

  // Streamed: the deltas add up to the same text as the non-streamed answer.
  const format = { type: 'json_schema', json_schema: { name: 's1', schema: schemas[1], strict: true } };
  const whole = await client.chat.completions.create({ ...base, seed: 9, response_format: format });
  let text = '';
  const stream = await client.chat.completions.create({
    ...base, seed: 9, response_format: format, stream: true,
  });
  for await (const chunk of stream) if (chunk.choices.length) text += chunk.choices[0].delta.content ?? '';
  assert.equal(text, whole.choices[0].message.content);
  outputs.push({ schema: schemas[1], text });

  // A keyword blend does not implement is a 400 naming it, never ignored.
  await assert.rejects(client.chat.completions.create({
    ...base, response_format: { type: 'json_schema',
      json_schema: { name: 'p', schema: { type: 'string', pattern: '^a+$' }, strict: true } },
  }), (e) => e.status === 400 && /pattern/.test(e.message));

  // n = 4: four choices of one prompt, one usage (prompt counted once), one prefill: the
  // other three samples take the prompt's KV from the prefix cache.
  const metric = async (name) => {
    const r = await fetch(`${baseURL.replace(/\/v1$/, '')}/metrics`,
                          { headers: { Authorization: `Bearer ${apiKey}` } });
    const line = (await r.text()).split('\n').find((l) => l.startsWith(name + ' '));
    return Number(line.split(' ')[1]);
  };
  const hitsBefore = await metric('blend:prefix_cache_hit_tokens_total');
  const four = await client.chat.completions.create({
    ...base, ...quoteBias, seed: 5, n: 4, response_format: { type: 'json_object' },
  });
  assert.equal(four.choices.length, 4);
  assert.deepEqual(four.choices.map((c) => c.index), [0, 1, 2, 3]);
  const texts = four.choices.map((c) => c.message.content);
  for (const t of texts) outputs.push({ schema: null, text: t });
  assert.ok(new Set(texts).size > 1, 'the four samples should differ (own seed streams)');
  // OpenAI's usage: the prompt once, the completion tokens of all choices.
  assert.equal(four.usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.ok(four.usage.completion_tokens >= 4 * 2, JSON.stringify(four.usage));
  assert.equal(four.usage.total_tokens, four.usage.prompt_tokens + four.usage.completion_tokens);
  const hits = (await metric('blend:prefix_cache_hit_tokens_total')) - hitsBefore;
  assert.ok(hits >= 3 * (four.usage.prompt_tokens - 1), `prefix cache hits ${hits}`);

  // Streamed with n = 2: every chunk names its choice, each choice's deltas make its text.
  const streamed = ['', ''];
  const finished = [null, null];
  const nStream = await client.chat.completions.create({
    ...base, ...quoteBias, seed: 5, n: 2, response_format: { type: 'json_object' }, stream: true,
  });
  for await (const chunk of nStream) {
    for (const c of chunk.choices) {
      streamed[c.index] += c.delta.content ?? '';
      if (c.finish_reason) finished[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(streamed, texts.slice(0, 2));
  assert.deepEqual(finished, ['stop', 'stop']);

  // Batch API line with a schema.
  const lines = JSON.stringify({
    custom_id: 'b0', method: 'POST', url: '/v1/chat/completions',
    body: { ...base, seed: 1, response_format: format },
  }) + '\n';
  const file = await client.files.create({
    file: await toFile(Buffer.from(lines), 'input.jsonl'), purpose: 'batch',
  });
  let batch = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h',
  });
  for (let i = 0; i < 2400 && batch.status !== 'completed'; ++i) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    batch = await client.batches.retrieve(batch.id);
  }
  assert.equal(batch.status, 'completed');
  const content = await (await client.files.content(batch.output_file_id)).text();
  const result = JSON.parse(content.trim());
  assert.equal(result.response.status_code, 200);
  outputs.push({ schema: schemas[1], text: result.response.body.choices[0].message.content });

  fs.writeFileSync(outFile, JSON.stringify(outputs));
  console.log(`openai structured: ok (${outputs.length} outputs)`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
