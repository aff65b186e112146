"""The web console\x27s server side (docs/console.md): page, sign-in, stream, data-plane relay."""
