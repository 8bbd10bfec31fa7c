"""HTTP rollout API: routes and schemas mounted on SGLang's FastAPI app."""
