"""One router per area; ``quotagate.http.app.ROUTERS`` lists them."""
