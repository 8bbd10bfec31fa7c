"""The serving wing: capture inside SGLang, the launch paths, responses, the Ray fleet."""
