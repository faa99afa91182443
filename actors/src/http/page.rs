//! The page at `/`: plain HTML, JavaScript and CSS compiled into the
//! binary, reading the same REST API as any other client.

use actix_web::{web, HttpResponse};

pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route(
            "/",
            web::get().to(|| file("text/html; charset=utf-8", include_str!("page/index.html"))),
        )
        .route(
            "/app.js",
            web::get().to(|| {
                file(
                    "text/javascript; charset=utf-8",
                    include_str!("page/app.js"),
                )
            }),
        )
        .route(
            "/style.css",
            web::get().to(|| file("text/css; charset=utf-8", include_str!("page/style.css"))),
        );
}

async fn file(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok().content_type(content_type).body(body)
}
