// The daemon's docs page: Swagger UI over /openapi.json. The page was opened with the
// daemon's cookie, which the same-origin fetch of the document sends along; "Try it out"
// requests go to this daemon, with the token given under "Authorize".
window.addEventListener("load", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#api-docs",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
